// CoreML/CoreML.h - NOT Apple's header: minimal stand-in declarations of the Core ML API that src/coreml_model.mm
// and src/coreml_backend.mm use, for the Linux syntax check (tests/objc/check_coreml_syntax.sh). Each declaration
// was written from its signature and availability in the macOS 15 / iOS 18 SDK's CoreML headers (read, not copied):
// MLMultiArray.h, MLFeatureType.h, MLFeatureValue.h, MLFeatureProvider.h, MLDictionaryFeatureProvider.h,
// MLMultiArrayConstraint.h, MLStateConstraint.h, MLFeatureDescription.h, MLModelDescription.h,
// MLModelConfiguration.h (+ MultiFunctions: functionName), MLState.h, MLModel.h, MLModel+MLModelCompilation.h,
// MLModel+MLState.h. Only what the backend calls is here.
#pragma once

#import <Foundation/Foundation.h>

NS_ASSUME_NONNULL_BEGIN

typedef NS_ENUM(NSInteger, MLMultiArrayDataType) {
  MLMultiArrayDataTypeDouble = 0x10000 | 64,
  MLMultiArrayDataTypeFloat64 API_AVAILABLE(macos(11.0), ios(14.0)) = 0x10000 | 64,
  MLMultiArrayDataTypeFloat32 = 0x10000 | 32,
  MLMultiArrayDataTypeFloat16 API_AVAILABLE(macos(12.0), ios(16.0)) = 0x10000 | 16,
  MLMultiArrayDataTypeFloat API_AVAILABLE(macos(11.0), ios(14.0)) = 0x10000 | 32,
  MLMultiArrayDataTypeInt32 = 0x20000 | 32,
};

typedef NS_ENUM(NSInteger, MLFeatureType) {
  MLFeatureTypeInvalid = 0,
  MLFeatureTypeInt64 = 1,
  MLFeatureTypeDouble = 2,
  MLFeatureTypeString = 3,
  MLFeatureTypeImage = 4,
  MLFeatureTypeMultiArray = 5,
  MLFeatureTypeDictionary = 6,
  MLFeatureTypeSequence = 7,
  MLFeatureTypeState API_AVAILABLE(macos(15.0), ios(18.0)) = 8,
};

typedef NS_ENUM(NSInteger, MLComputeUnits) {
  MLComputeUnitsCPUOnly = 0,
  MLComputeUnitsCPUAndGPU = 1,
  MLComputeUnitsAll = 2,
  MLComputeUnitsCPUAndNeuralEngine API_AVAILABLE(macos(13.0), ios(16.0)) = 3,
};

@interface MLMultiArray : NSObject
@property (readonly, nonatomic) MLMultiArrayDataType dataType;
@property (readonly, nonatomic) NSArray<NSNumber*>* shape;
@property (readonly, nonatomic) NSArray<NSNumber*>* strides;
@property (readonly, nonatomic) NSInteger count;
- (nullable instancetype)initWithShape:(NSArray<NSNumber*>*)shape
                              dataType:(MLMultiArrayDataType)dataType
                                 error:(NSError**)error;
- (nullable instancetype)initWithDataPointer:(void*)dataPointer
                                       shape:(NSArray<NSNumber*>*)shape
                                    dataType:(MLMultiArrayDataType)dataType
                                     strides:(NSArray<NSNumber*>*)strides
                                 deallocator:(void (^_Nullable)(void* bytes))deallocator
                                       error:(NSError**)error;
- (void)getBytesWithHandler:(void (NS_NOESCAPE ^)(const void* bytes, NSInteger size))handler
    API_AVAILABLE(macos(12.3), ios(15.4));
- (void)getMutableBytesWithHandler:(void (NS_NOESCAPE ^)(void* mutableBytes, NSInteger size,
                                                         NSArray<NSNumber*>* strides))handler
    API_AVAILABLE(macos(12.3), ios(15.4));
@end

@interface MLFeatureValue : NSObject
@property (readonly, nullable, nonatomic) MLMultiArray* multiArrayValue;
+ (instancetype)featureValueWithMultiArray:(MLMultiArray*)value;
@end

@protocol MLFeatureProvider
@property (readonly, nonatomic) NSSet<NSString*>* featureNames;
- (nullable MLFeatureValue*)featureValueForName:(NSString*)featureName;
@end

@interface MLDictionaryFeatureProvider : NSObject <MLFeatureProvider>
- (nullable instancetype)initWithDictionary:(NSDictionary<NSString*, id>*)dictionary error:(NSError**)error;
@end

@interface MLMultiArrayConstraint : NSObject
@property (readonly, nonatomic) NSArray<NSNumber*>* shape;
@property (readonly, nonatomic) MLMultiArrayDataType dataType;
@end

API_AVAILABLE(macos(15.0), ios(18.0))
@interface MLStateConstraint : NSObject
@property (readonly, nonatomic) NSArray<NSNumber*>* bufferShape;
@property (readonly, nonatomic) MLMultiArrayDataType dataType;
@end

@interface MLFeatureDescription : NSObject
@property (readonly, nonatomic, copy) NSString* name;
@property (readonly, nonatomic) MLFeatureType type;
@property (readonly, nullable, nonatomic) MLMultiArrayConstraint* multiArrayConstraint;
@property (readonly, nullable, nonatomic) MLStateConstraint* stateConstraint API_AVAILABLE(macos(15.0), ios(18.0));
@end

@interface MLModelDescription : NSObject
@property (readonly, nonatomic) NSDictionary<NSString*, MLFeatureDescription*>* inputDescriptionsByName;
@property (readonly, nonatomic) NSDictionary<NSString*, MLFeatureDescription*>* outputDescriptionsByName;
@property (readonly, nonatomic) NSDictionary<NSString*, MLFeatureDescription*>* stateDescriptionsByName
    API_AVAILABLE(macos(15.0), ios(18.0));
@end

@interface MLModelConfiguration : NSObject
@property (readwrite) MLComputeUnits computeUnits;
@property (readwrite, nullable, copy, nonatomic) NSString* functionName API_AVAILABLE(macos(15.0), ios(18.0));
@end

API_AVAILABLE(macos(15.0), ios(18.0))
@interface MLState : NSObject
- (instancetype)init __attribute__((unavailable));
+ (instancetype)new __attribute__((unavailable));
@end

@interface MLModel : NSObject
@property (readonly, nonatomic) MLModelDescription* modelDescription;
+ (nullable instancetype)modelWithContentsOfURL:(NSURL*)url
                                  configuration:(MLModelConfiguration*)configuration
                                          error:(NSError* _Nullable __autoreleasing*)error;
- (nullable id<MLFeatureProvider>)predictionFromFeatures:(id<MLFeatureProvider>)input
                                                   error:(NSError* __autoreleasing*)error;
+ (nullable NSURL*)compileModelAtURL:(NSURL*)modelURL error:(NSError**)error;
@end

API_AVAILABLE(macos(15.0), ios(18.0))
@interface MLModel (MLState)
- (MLState*)newState API_AVAILABLE(macos(15.0), ios(18.0));
- (nullable id<MLFeatureProvider>)predictionFromFeatures:(id<MLFeatureProvider>)inputFeatures
                                              usingState:(MLState*)state
                                                   error:(NSError* __autoreleasing*)error
    API_AVAILABLE(macos(15.0), ios(18.0));
@end

NS_ASSUME_NONNULL_END
